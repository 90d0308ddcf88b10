from advisor.cli import app

app(prog_name="advisor")
