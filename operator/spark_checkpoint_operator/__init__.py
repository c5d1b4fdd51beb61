"""The control plane: the coordinator core and its adapters (the local runtime, the Kopf
operator, the command line).

It never imports pyspark; it reaches the data plane only through the agent's HTTP API, the
storage format and the driver's command line.
"""
