-- Correlation properties of saga instances: further values that find an instance (a
-- payment id, say), set by its handlers with SagaContext::correlate_by. One value belongs
-- to one instance of a saga type; one value per name per instance.
CREATE TABLE courier_saga_property (
    saga_type   TEXT NOT NULL,
    name        TEXT NOT NULL,
    value       TEXT NOT NULL,
    correlation TEXT NOT NULL,
    PRIMARY KEY (saga_type, name, value)
) WITHOUT ROWID;
CREATE UNIQUE INDEX courier_saga_property_instance ON courier_saga_property (saga_type, correlation, name);
