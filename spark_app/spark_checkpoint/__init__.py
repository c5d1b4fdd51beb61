"""The data plane: what runs inside the Spark driver and what user pipelines import.

Importing this package does not import pyspark; the modules that need Spark import it
themselves, so the storage format can be shared with the control plane.
"""
