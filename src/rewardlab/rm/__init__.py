"""Reward models: Bradley–Terry outcome models (`bradley_terry`), process reward models (`prm`), automatic step labels
(`labels`), preference and step data (`data`), and the evaluation of any scorer (`evaluate`)."""
