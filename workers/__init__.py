"""Aurora's processes: trainer, actor, relay, and the RL that drives them."""
