-- Correlation properties of saga instances: further values that find an instance (a
-- payment id, say), set by its handlers with SagaContext::correlate_by. One value belongs
-- to one instance of a saga type; one value per name per instance.
CREATE TABLE courier.saga_property (
    saga_type   text NOT NULL,
    name        text NOT NULL,
    value       text NOT NULL,
    correlation text NOT NULL,
    PRIMARY KEY (saga_type, name, value)
);
CREATE UNIQUE INDEX saga_property_instance ON courier.saga_property (saga_type, correlation, name);
