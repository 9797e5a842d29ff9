-- Any delete of history events deletes their saga instance rows (issue 33). The foreign
-- key that did so by its cascade is gone (20261207000001: its check cost every insert);
-- this trigger does the cascade's part once per statement, from the deleted rows, and
-- costs an insert nothing. So an operator's own delete (a deletion request by
-- conversation, say) leaves no instance row behind, with a correlation that may be
-- personal data, just as the janitor's purge does.
CREATE FUNCTION courier.history_delete_instances() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM courier.history_instance WHERE history_id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;

CREATE TRIGGER history_delete_instances AFTER DELETE ON courier.history
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION courier.history_delete_instances();
