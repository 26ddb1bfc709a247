"""(filled in next)"""
