"""Learning the mixture and the curriculum (TerRIFIC curricula): the influence primitive, the loops, realization."""
