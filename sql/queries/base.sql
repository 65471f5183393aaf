-- What every part of the store uses (app/minutehand/store/base.py): the
-- session's clock, the database's clock, the schema's revision.

-- name: set_clock
-- Pin this session's clock (tests); NULL unpins it.
SELECT set_config('minutehand.now', coalesce(%(now)s::text, ''), false)

-- name: schema_revision
-- The Alembic revision the database is at (readiness).
SELECT (SELECT version_num FROM alembic_version LIMIT 1) AS revision

-- name: db_now
-- The database's clock (mh_now(): pinned in tests), from which fire times are computed.
SELECT mh_now() AS now
