"""The Python worker library: register handlers by job name, run them with
a concurrency limit against one or more dispatchers.

    from minutehand.worker import Job, NonRetryable, Worker

    worker = Worker(urls=["http://127.0.0.1:8080"], token="mhw_...", concurrency=10)

    @worker.job("send_report")
    def send_report(job: Job):
        if "to" not in job.payload:
            raise NonRetryable("no recipient")      # dead at once, not retried
        ...
        return {"sent": True}                        # stored as the job's result

    worker.run()   # or: minutehand worker mymodule:worker

Modules: worker.py (Worker: handlers, run, stop), settings.py (WorkerSettings),
session.py (one run: its parts started and stopped in order), poller.py (a
dispatcher's lease loop), runner.py (a job: handler, report),
heartbeats.py (the running jobs' claims kept alive), outbox.py (outcomes in batches), slots.py (the concurrency limit),
threads.py (threads for sync handlers), grace.py (the stop deadline),
client.py (HTTP calls), job.py (Job, NonRetryable), traces.py (the handler's span, with
OpenTelemetry installed), effects.py
(exactly-once database side effects; needs psycopg, imported on use),
logs.py (JSON log lines).

It imports only itself, minutehand.protocol and two leaves
(minutehand.lifecycle, minutehand.envconfig): it installs and runs with
`pip install minutehand-scheduler` alone, without the server's dependencies.
"""
from minutehand.worker.job import Job, NonRetryable
from minutehand.worker.worker import Worker

__all__ = ["Job", "NonRetryable", "Worker"]
