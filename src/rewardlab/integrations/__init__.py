"""rewardlab inside the engines people already run: `integrations.trl` (TRL's GRPOTrainer reward functions and
datasets) and `integrations.verl` (verl's custom reward function and advantage estimators). Neither module imports
its peer at import time; `integrations.verl_agent` (rewardlab environments as a verl agent loop) does, and registers
the loop when imported. docs/integrations.md shows the few lines each needs."""
