"""Preference optimization: the DPO family of losses (`rewardlab.po.losses`)."""
