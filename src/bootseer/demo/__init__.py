"""The end-to-end demo: a small real training job started the conventional way, then by
bootseer twice (recording, then prefetching), with the per-phase breakdown of each."""
