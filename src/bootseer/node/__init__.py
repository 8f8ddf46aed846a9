"""The OS facts of one machine: processes and their liveness, liveness marks, part files,
the mount table, and output files a user names. Imports nothing of bootseer above
``config`` and ``errors``: every layer may rely on it."""
