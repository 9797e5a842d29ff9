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
