"""What the stages hand each other: the typed records (`records`), where each is written (`layout`) and
which rank of a run does what (`topology`). It imports nothing above the configuration."""
