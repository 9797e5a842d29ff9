/// Open a new channel on the connection, identified by its channel number.
