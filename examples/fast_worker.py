"""A TaskFlow worker at a job queue's speed: claims up to 10 tasks of the `examples` queue in one
request, doubles each payload["n"], completes the batch in one request; stops after 3 idle seconds.

    TASKFLOW_URL=http://127.0.0.1:8000 TASKFLOW_KEY=tfk_... PYTHONPATH=. python examples/fast_worker.py

Two round trips per ten tasks (examples/worker.py makes one per task). One background thread
renews the batch's leases while it works; a task whose handler raises is failed alone (with its
traceback), the others of the batch complete. For short tasks: each claimed task waits for the
ones before it in its batch, so keep a batch's work well within its leases' TTL.
"""
import os

from taskflow_client import Client

QUEUE = "examples"


def double(job):
    return {"double": 2 * job.payload["n"]}  # the task's result; an exception fails this task only


client = Client(os.environ["TASKFLOW_URL"], os.environ["TASKFLOW_KEY"])
counts = client.work(double, max_tasks=10, ttl_seconds=30, queue=QUEUE, wait_seconds=3)
print(f"fast worker: {counts.get('completed', 0)} task(s) completed, {counts.get('failed', 0)} failed")
