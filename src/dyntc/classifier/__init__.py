"""The user-facing :class:`DynamicClassifier`, split the way SetFit separates model and trainer:

- :mod:`~dyntc.classifier.model`: the encoder + metric as a space for texts (points, means, distances);
- :mod:`~dyntc.classifier.labels`: the label set (support examples, prototypes, label operations);
- :mod:`~dyntc.classifier.fit`: episodic training and fine-tuning;
- :mod:`~dyntc.classifier.store`: the versioned, locked, crash-safe store of a model directory
  (shared by the library, the CLI and the HTTP service);
- :mod:`~dyntc.classifier.estimator`: :class:`DynamicClassifier`, the scikit-learn-style estimator
  that joins them.
"""

from dyntc.classifier.estimator import CLASSIFIER_FORMAT, DynamicClassifier
from dyntc.classifier.store import STORE_FILE, ModelStore

__all__ = ["CLASSIFIER_FORMAT", "DynamicClassifier", "ModelStore", "STORE_FILE"]
