# JupyterHub with batchspawner's SlurmSpawner: each user's Jupyter server is a Slurm job, and its kernels run
# inside that job's allocation (see docs/deployment.md). Checked with JupyterHub 6.1.1, batchspawner 1.3.0
# and configurable-http-proxy 5.3.0 by tests/cluster/test_hub_browser.py, which loads this file and adds
# only what its private test cluster needs (a dummy login, addresses, state folders).
#
# WORKBENCH_VENV: the environment with jupyterlab and distributed-workbench that the users' servers run from
# (the one this hub runs from, unless set). SLURM_CONF: where sbatch finds the cluster's configuration.
import os
import sys

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)
venv = os.environ.get("WORKBENCH_VENV", sys.prefix)

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.Spawner.cmd = [f"{venv}/bin/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
# the server runs on a compute node: listen on its address, not its loopback, so the hub's proxy reaches it
c.Spawner.ip = "0.0.0.0"
c.Spawner.start_timeout = 300  # the job may queue
c.Spawner.http_timeout = 120
# sbatch runs with the spawner's environment only ("failed to fetch config" otherwise)
c.Spawner.environment = {"SLURM_CONF": os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")}
# the job's PATH is not the hub's: the wrapper by its full path
c.BatchSpawnerBase.batchspawner_singleuser_cmd = f"{venv}/bin/batchspawner-singleuser"
c.BatchSpawnerBase.req_runtime = "4:00:00"
# the form's "2 nodes": the allocation the notebook's pool runs in (`%dist start` inside it)
c.BatchSpawnerBase.req_options = "--nodes=2 --exclusive"
# the server is the batch script on the first node, as Open OnDemand starts it (with srun, the default, a
# 2-node job would start a server on each node)
c.SlurmSpawner.req_srun = ""
