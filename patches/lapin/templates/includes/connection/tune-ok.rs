/// Client confirmation of negotiated connection parameters (channel max, frame max, heartbeat).
