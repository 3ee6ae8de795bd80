"""rewardlab inside the engines people already run: `integrations.trl` (TRL's GRPOTrainer reward functions and
datasets) and `integrations.verl` (verl's custom reward function and advantage estimators). Neither module imports
its peer at import time; docs/integrations.md shows the few lines each needs."""
