"""Distribution-target statistics: group-sequential tests, their boundaries, i.i.d. betting confidence sequences, comparisons, rankings and selection."""
