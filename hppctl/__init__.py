"""hppctl: hybrid pipeline parallelism and collaborative inference on heterogeneous edge devices."""

__version__ = "0.1.0"
