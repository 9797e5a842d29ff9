/// Server response to `basic.get`, carrying the next message from the queue.
