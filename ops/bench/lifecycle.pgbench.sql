-- claim(100)+complete through the procedures, driven by pgbench like the
-- floor (same C client, same -M prepared), so the two compare server to
-- server. The lease epoch is read per call; the benchmark leases every
-- shard to 'pgbench' first. :ids and :toks are sent as text parameters.
\set shard random(0, 255)
SELECT coalesce(array_agg(job_id)::text, '{}') AS ids, coalesce(array_agg(lease_token)::text, '{}') AS toks
  FROM claim_due(:shard, 100, 'pgbench', (SELECT epoch FROM shards WHERE shard = :shard), 60) \gset
SELECT count(*) FROM complete_many(:ids::bigint[], :toks::uuid[], NULL);
