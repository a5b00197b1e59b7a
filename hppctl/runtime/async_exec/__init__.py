"""Runtime of the asynchronous schedules (TiMePReSt's nf1b and the PipeDream baseline)."""
