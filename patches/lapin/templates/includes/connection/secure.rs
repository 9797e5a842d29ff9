/// Server challenge for multi-step SASL authentication (e.g. `RABBIT-CR-DEMO`).
