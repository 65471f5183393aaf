-- Undo revision 0001: everything it created, in dependency order.
DROP FUNCTION IF EXISTS maintain, purge_idempotency_keys, sweep_passed, mh_carry_forward, mh_move_down, cascade_wheel, expire_claims,
    cancel, fail, complete, heartbeat, start, fail_many, complete_many, heartbeat_many, start_many,
    mh_backoff, mh_job_state, mh_refusal, next_due, claim_due, mh_move_hand, mh_bucket_has_rows, mh_claim_sql, release_shard_lease, take_shard_lease,
    submit_jobs, mh_batch_items, submit_job, submit_job_detail, mh_submit_keyed, mh_write_job, mh_team_id, mh_run_at, mh_request_hash, mh_job_problem,
    mh_payload_problem, mh_enqueue_many, mh_enqueue, mh_hour_end, mh_minute_end, mh_hour_part,
    mh_minute_part, mh_hour_slot, mh_minute_slot, mh_key_shard, mh_random_shard, mh_shard_of, mh_new_id, mh_id_at,
    mh_hour, mh_minute, mh_now, mh_idempotency_ttl, mh_max_ahead, mh_payload_max_bytes, mh_hour_span,
    mh_hour_slots, mh_sweep_after, mh_horizon, mh_minute_slots, mh_shard_count;
DROP TABLE IF EXISTS due_minutes, due_hours, due_far, wheel, shards, claim_checks, idempotency_keys, jobs, teams;
DROP TYPE IF EXISTS submit_result, outcome, due_row, job_state;
DROP SEQUENCE IF EXISTS job_id_seq;
