"""A TaskFlow worker: holds one task at a time, doubles payload["n"], stops after 3 idle seconds.

    TASKFLOW_URL=http://127.0.0.1:8000 TASKFLOW_KEY=tfk_... PYTHONPATH=. python examples/worker.py
"""
import os

from taskflow_client import Client

client = Client(os.environ["TASKFLOW_URL"], os.environ["TASKFLOW_KEY"])
done = 0
while True:
    with client.hold(ttl_seconds=30, wait_seconds=3) as job:  # renewed in the background
        if job is None:
            break  # no work for 3 s
        job.result = {"double": 2 * job.payload["n"]}  # completed on exit; an exception fails it
        done += 1
print(f"worker: {done} task(s) completed")
