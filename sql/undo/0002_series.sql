-- undo of revision 0002 (sql/007_series.sql)
SELECT 1;
