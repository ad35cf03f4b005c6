"""What the tests share that is not a fixture: tiny models and texts (tiny), tiny runs and their launch
(runs), tiny QEs (qe), the energy tests' own world (energy) and a fake hub (hub). Fixtures live in
conftest.py."""
