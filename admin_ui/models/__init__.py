"""Qt table models of the console (QAbstractTableModel over plain records)."""
