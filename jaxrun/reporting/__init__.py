"""After an attempt: one diagnosis of its outcome, and the reports that format it
(the console summary, the JSON run report, JUnit XML, GitHub annotations),
and the record of finished runs that ``jaxrun logs`` reads."""
