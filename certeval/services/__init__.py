"""The services a command starts: Ray, Prefect's server and the model actors started together, a local multi-node Ray cluster, ``certeval up``/``down``."""
