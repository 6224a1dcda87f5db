"""The objects the SDK hands back (the contract's response models with behaviour) and the API groups that make
them: ``client.jobs``, ``client.sweeps``, ``client.trials``, ``client.deployments``, ``client.code``,
``client.projects``."""
