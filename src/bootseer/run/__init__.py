"""``bootseer run``: one launcher per node that overlaps image prefetch, dependency restore
and checkpoint prefetch, then runs the job's command in the lazily loaded image."""
