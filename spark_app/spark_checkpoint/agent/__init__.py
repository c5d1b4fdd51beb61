"""The checkpoint agent: runs in the Spark driver, serves the control API, takes snapshots."""
