"""``spark-checkpoint list|inspect|verify``: what is in a job's checkpoint storage.

Storage is read through ``spark_checkpoint.storage`` only (the format's own reader and
checks), never written. Storage alone cannot say which snapshots are valid: the
coordinator's registry does. Locally that is the status file of ``spark-checkpoint run``
(``<state-dir>/<namespace>/<job>/status.json``), which these commands read when present
to mark each snapshot registered or unregistered.

Exit codes (``exit_codes.ExitCode``): 0 success; 1 a snapshot cannot be read or
failed verification; 2 the command line, the manifest or the storage address is wrong.

- ``job``: the job's storage and registry, from a manifest or explicit flags;
- ``snapshots``: what storage holds, and the verification of its bytes;
- ``rendering``: tables for people, JSON and YAML documents for scripts;
- ``commands``: the three commands, from arguments to exit code.
"""
