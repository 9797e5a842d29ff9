-- Each endpoint purges its own inbox records (its retention may differ from another's):
-- the cleanup finds them by (endpoint, processed_at).
DROP INDEX courier.inbox_processed_at;
CREATE INDEX inbox_endpoint_processed_at ON courier.inbox (endpoint, processed_at);
