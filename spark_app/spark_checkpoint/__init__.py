"""The data plane: what runs inside the Spark driver and what user pipelines import.

Importing this package does not import pyspark; the modules that need Spark import it
themselves, so the storage format can be shared with the control plane.
"""

import os

# gcsfs (2026.8 on) makes its filesystem for gs:// a class for zonal and hierarchical-
# namespace buckets unless this is false: on a zonal bucket its create-only write
# overwrites (the sink's commit records would no longer fence a second writer), and it asks
# GCS's gRPC Storage Control API for each bucket's layout, again at each operation where
# the answer is an error. The classic filesystem is what the test suite runs. Read as gcsfs
# is imported, so set before anything here reaches storage; a value the user set stays, and
# the sink refuses to commit through that class (`sink_storage`).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
