"""The user-facing :class:`DynamicClassifier`, split the way SetFit separates model and trainer:

- :mod:`~dyntc.classifier.space`: the encoder + metric as a space for texts (points, means, distances);
- :mod:`~dyntc.classifier.labels`: the label set (support examples, prototypes, label operations);
- :mod:`~dyntc.classifier.head` and :mod:`~dyntc.classifier.live_head`: the cosine head over the
  label set, and its background refresh;
- :mod:`~dyntc.classifier.trainer`: the trainer (episodic training and fine-tuning of a network);
- :mod:`~dyntc.classifier.calibration`: temperature, calibration error, out-of-scope threshold, and
  :mod:`~dyntc.classifier.rejection`: calibrate and the kept out-of-scope examples' push on a classifier;
- :mod:`~dyntc.classifier.store`: the versioned, locked, crash-safe store of a model directory
  (shared by the library, the CLI and the HTTP service), and :mod:`~dyntc.classifier.saving`:
  the classifier committed to and rebuilt from it;
- :mod:`~dyntc.classifier.params`: what the estimator's parameters accept and mean;
- :mod:`~dyntc.classifier.estimator`: :class:`DynamicClassifier`, the scikit-learn-style estimator
  that holds the state and joins them (none of them knows it).
"""

from dyntc.classifier.estimator import DynamicClassifier
from dyntc.classifier.saving import CLASSIFIER_FORMAT
from dyntc.classifier.store import STORE_FILE, ModelStore

__all__ = ["CLASSIFIER_FORMAT", "DynamicClassifier", "ModelStore", "STORE_FILE"]
