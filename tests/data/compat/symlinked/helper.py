VALUE = "helper found next to the real script"
