"""The commands people run: train, plot, check, export, backtest, and what they show and save."""
