// The live board's client.
