"""Processes we own: starting, finding, reading and stopping them; telling a broken environment apart."""
