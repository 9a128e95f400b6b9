"""torch event JSON exactly as torch's ``Event.serialize()`` / ``RdzvEvent.serialize()`` write it:
the parser's inputs (``test_parsing.py``), checked against real torch objects
(``test_torch_event_objects.py``)."""

WORKER_FAILED_JSON = (
    r'{"name": "torchelastic.worker.status.FAILED", "source": "WORKER", "timestamp":'
    r' 0, "metadata": {"run_id": "job-7", "global_rank": 3, "group_rank": 1,'
    r' "worker_id": "4242", "role": "trainer", "hostname": "node-b.example", "state":'
    r' "FAILED", "total_run_time": 12, "rdzv_backend": "c10d", "raw_error":'
    r' "{\"message\": {\"message\": \"RuntimeError: injected failure on rank 1\",'
    r" \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n  File"
    r" \\\"train.py\\\", line 30, in <module>\\nRuntimeError: injected failure on rank"
    r' 1\\n\", \"timestamp\": \"1700000000\"}}}", "metadata": "{\"group_world_size\":'
    r" 2, \"entry_point\": \"python\", \"local_rank\": [1], \"role_rank\": [3],"
    r' \"role_world_size\": [4], \"exit_code\": [1], \"worker_pid\": [4242]}",'
    r' "agent_restarts": 1, "duration_ms": null}}'
)

WORKER_SUCCEEDED_AT_JSON = (
    r'{"name": "torchelastic.worker.status.SUCCEEDED", "source": "WORKER",'
    r' "timestamp": 1650000000250, "metadata": {"run_id": "job-7", "global_rank": 3,'
    r' "group_rank": 1, "worker_id": "4242", "role": "trainer", "hostname":'
    r' "node-b.example", "state": "SUCCEEDED", "total_run_time": 12, "rdzv_backend":'
    r' "c10d", "raw_error": null, "metadata": "{\"group_world_size\": 2,'
    r" \"entry_point\": \"python\", \"local_rank\": [1], \"role_rank\": [3],"
    r' \"role_world_size\": [4], \"exit_code\": [null], \"worker_pid\": [4242]}",'
    r' "agent_restarts": 1, "duration_ms": null}}'
)

WORKER_TERMINATED_JSON = (
    r'{"name": "torchelastic.worker.status.TERMINATED", "source": "WORKER",'
    r' "timestamp": 0, "metadata": {"run_id": "job-7", "global_rank": 3, "group_rank":'
    r' 1, "worker_id": "4242", "role": "trainer", "hostname": "node-b.example",'
    r' "state": "TERMINATED", "total_run_time": 12, "rdzv_backend": "c10d",'
    r' "raw_error": "{\"message\": \"<NONE>\", \"errorTraits\": {\"category\":'
    r' \"system_terminated_error\"}}", "metadata": "{\"group_world_size\": 2,'
    r" \"entry_point\": \"python\", \"local_rank\": [1], \"role_rank\": [3],"
    r' \"role_world_size\": [4], \"exit_code\": [null], \"worker_pid\": [4242]}",'
    r' "agent_restarts": 1, "duration_ms": null}}'
)

AGENT_FAILED_JSON = (
    r'{"name": "torchelastic.worker.status.FAILED", "source": "AGENT", "timestamp": 0,'
    r' "metadata": {"run_id": "job-7", "global_rank": null, "group_rank": null,'
    r' "worker_id": null, "role": "trainer", "hostname": "node-b.example", "state":'
    r' "FAILED", "total_run_time": 30, "rdzv_backend": "c10d", "raw_error": "Traceback'
    r" (most recent call last):\n  File \"api.py\", line 3, in"
    r" next_rendezvous\ntorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError:"
    r' timed out\n", "metadata": "{\"group_world_size\": null, \"entry_point\":'
    r' \"python\"}", "agent_restarts": 0, "duration_ms": null}}'
)

USER_EVENT_JSON = (
    r'{"name": "my.checkpoint", "source": "WORKER", "timestamp": 0, "metadata":'
    r' {"step": 10, "path": "/ckpt", "ok": true}}'
)

RDZV_JOINED_JSON = (
    r'{"name": "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous",'
    ' "run_id": "job-7", "message": "The node \'node-b.example_777_0\' has joined round'
    ' 3 of the rendezvous \'job-7\' as rank 1 in a world of size 4.", "hostname":'
    r' "node-b.example", "pid": 777, "node_state": "RUNNING", "master_endpoint":'
    r' "10.0.0.1:29400", "rank": 1, "local_id": 0, "error_trace": ""}'
)

RDZV_JOINED_RANK_IN_MESSAGE_JSON = (
    r'{"name": "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous",'
    ' "run_id": "job-7", "message": "The node \'node-b.example_777_0\' has joined round'
    ' 0 of the rendezvous \'job-7\' as rank 5 in a world of size 8.", "hostname":'
    r' "node-b.example", "pid": 777, "node_state": "RUNNING", "master_endpoint": "",'
    r' "rank": null, "local_id": 0, "error_trace": ""}'
)

RDZV_FAILED_JSON = (
    r'{"name": "dynamic_rendezvous.py:DynamicRendezvousHandler.next_rendezvous",'
    r' "run_id": "job-7", "message": "RendezvousTimeoutError: The node'
    ' \'node-b.example_777_0\' timed out.", "hostname": "node-b.example", "pid": 777,'
    r' "node_state": "FAILED", "master_endpoint": "", "rank": null, "local_id": 0,'
    r' "error_trace": "Traceback (most recent call last):\n  File'
    r" \"dynamic_rendezvous.py\", line 1170, in"
    r" next_rendezvous\ntorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError:"
    r' The node timed out.\n"}'
)
