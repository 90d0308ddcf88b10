"""The Ray executor: the driver's side, the agent on each node, and the cluster connection."""
