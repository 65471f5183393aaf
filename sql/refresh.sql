-- Run by every migrate that ends at head, after the functions: data the
-- schema copies from the server. The time zone names follow tzdata updates.
INSERT INTO timezone_names SELECT DISTINCT name FROM pg_timezone_names ON CONFLICT DO NOTHING;
