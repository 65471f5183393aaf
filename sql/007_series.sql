-- minutehand 007: series (repeating jobs). Filled in below.
SELECT 1;
