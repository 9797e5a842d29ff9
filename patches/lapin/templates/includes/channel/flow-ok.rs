/// Server confirmation of the current message flow state on the channel.
