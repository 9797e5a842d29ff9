-- Each endpoint purges its own inbox records (its retention may differ from another's):
-- the cleanup finds them by (endpoint, processed_at).
DROP INDEX courier_inbox_processed_at;
CREATE INDEX courier_inbox_endpoint_processed_at ON courier_inbox (endpoint, processed_at);
