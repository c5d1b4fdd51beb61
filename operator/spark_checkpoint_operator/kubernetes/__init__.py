"""The Kubernetes runtime: the SparkCheckpointJob controller, its pods and its status."""
