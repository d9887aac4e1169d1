"""A TaskFlow worker: holds one task of the `examples` queue at a time, doubles payload["n"],
stops after 3 idle seconds.

    TASKFLOW_URL=http://127.0.0.1:8000 TASKFLOW_KEY=tfk_... PYTHONPATH=. python examples/worker.py

It claims only from its own queue: on a busy board, a task meant for another kind of worker
(another payload) is left to that worker instead of being taken and failed here.
"""
import os

from taskflow_client import Client

QUEUE = "examples"

client = Client(os.environ["TASKFLOW_URL"], os.environ["TASKFLOW_KEY"])
done = 0
while True:
    with client.hold(ttl_seconds=30, queue=QUEUE, wait_seconds=3) as job:  # renewed in the background
        if job is None:
            break  # no work in the queue for 3 s
        job.result = {"double": 2 * job.payload["n"]}  # completed on exit; an exception fails it
        done += 1
print(f"worker: {done} task(s) completed")
