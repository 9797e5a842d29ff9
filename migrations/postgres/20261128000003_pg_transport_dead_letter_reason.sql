-- A dead-lettered row says why (issue 30): Courier writes a reason and a description with
-- every dead-lettering; a row another program writes in the dead-letter state without
-- them is refused at INSERT. Rows already there get a reason that says what happened.
UPDATE courier.message SET
    dl_reason = coalesce(dl_reason, 'courier.InvalidWireFormat'),
    dl_description = coalesce(dl_description,
        'the row was written in the dead-letter state without a reason (found when the rule was added)')
WHERE state = 3 AND (dl_reason IS NULL OR dl_description IS NULL);

ALTER TABLE courier.message
    ADD CONSTRAINT message_dead_letter_has_reason
        CHECK (state <> 3 OR (dl_reason IS NOT NULL AND dl_description IS NOT NULL));

-- A session id has 1 to 128 bytes, as Courier's senders check (a longer one also makes
-- Postgres refuse the row's entry in the sessions index, which failed the activation of a
-- scheduled row); a dead-lettered row keeps what it had.
UPDATE courier.message SET state = 3, locked_until = NULL, dl_reason = 'courier.InvalidWireFormat',
    dl_description = 'session_id has ' || octet_length(session_id)
        || ' bytes; Courier''s session ids have 1 to 128 (found when the rule was added)'
WHERE state <> 3 AND session_id IS NOT NULL AND octet_length(session_id) NOT BETWEEN 1 AND 128;

ALTER TABLE courier.message
    ADD CONSTRAINT message_session_id_length
        CHECK (state = 3 OR session_id IS NULL OR octet_length(session_id) BETWEEN 1 AND 128);
