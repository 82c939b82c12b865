"""The core both wings build on: files and machine facts, text, episodes, the metric geometry,
encoders, the networks, inference and training. It imports neither wing (`classifier/`,
`protocol/`); tests/test_layers.py checks it."""
