"""Kubernetes test doubles: an API-server emulator (``emulator``) to run real Kopf against."""
