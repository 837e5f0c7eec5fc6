"""Controllers other than a script's: the console's, the probe's, the pytest plugin's."""
