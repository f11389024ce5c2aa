"""The serving side's runtime rooms, one folder per kernel runtime."""
